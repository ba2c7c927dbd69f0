"""A batch crosses from a data-loader worker as one slim buffer of bytes (issue 54 item 6):
no tensor travels, integers in the smallest dtype that holds them, a repeated value alone,
and the main process gets back the same tensors (dtypes, shapes, values, key order)."""

import pickle

import torch

from pretrain.data.batch_wire import WIRE_KEY, pack_batch, unpack_batch


def a_batch() -> dict:
    ids = torch.randint(0, 8000, (4, 16), generator=torch.Generator().manual_seed(0))
    labels = torch.full((4, 16), -100)
    labels[:, 3] = ids[:, 3]
    return {
        "input_ids": ids,
        "token_type_ids": torch.zeros(4, 16, dtype=torch.long),  # one segment
        "keys": ["a", "b", "c", "d"],
        "attention_mask": torch.tensor([[1] * 16, [1] * 16, [1] * 9 + [0] * 7, [1] * 16]),
        "labels": labels,
        "next_sentence_label": torch.tensor([0, 1, 1, 0]),
        "wide": torch.tensor([2**40, -(2**35)]),
        "flags": torch.tensor([True, False, True]),
        "weights": torch.rand(3, 2),
        "half": torch.rand(2, dtype=torch.bfloat16),  # no numpy dtype: as it is
        "empty": torch.zeros(0, 7, dtype=torch.long),
        "marker": (3, False),
    }


def test_the_main_process_gets_the_same_tensors_back():
    batch = a_batch()
    back = unpack_batch(pickle.loads(pickle.dumps(pack_batch(dict(batch)))))
    assert list(back) == list(batch)
    for name, value in batch.items():
        if isinstance(value, torch.Tensor):
            assert back[name].dtype == value.dtype and back[name].shape == value.shape, name
            assert torch.equal(back[name], value), name
        else:
            assert back[name] == value


def test_what_crosses_is_one_slim_buffer():
    batch = a_batch()
    packed = pack_batch(dict(batch))
    crossing = [v for k, v in packed.items() if isinstance(v, torch.Tensor)]
    assert crossing == [packed["half"]]  # only what numpy cannot hold travels as a tensor
    layout, data = packed[WIRE_KEY]
    how = {name: way for name, _, _, way, _ in layout}
    assert how["token_type_ids"] == "fill" and how["input_ids"] == "<i2"
    assert how["labels"] == "<i2" and how["attention_mask"] == "|u1" and how["wide"] == "<i8"
    sent = 4 * 16 * (2 + 1 + 2)  # ids, mask and labels narrowed; token types not sent
    others = 4 + 16 + 3 + 24  # next_sentence_label as uint8, wide, flags, weights
    assert sent + others <= len(data) <= sent + others + 8 * len(layout)  # parts 8-aligned
    assert len(data) < sum(v.nbytes for v in batch.values() if isinstance(v, torch.Tensor)) / 4


def test_anything_but_a_batch_of_tensors_passes_as_it_is():
    end = {"end_of_epoch": "marker"}
    assert pack_batch(end) is end and unpack_batch(end) is end
    assert pack_batch([1, 2]) == [1, 2]
