"""A context-extension stage's arithmetic (`stages.StageLengths`): with equal lengths it is the
stages' i x L progress exactly; with a longer second phase, samples count their phase's length
and the phase begins at the first sample whose progress reaches its until_tokens."""

import numpy as np

from pretrain.data.stages import StageLengths, sample_progress_tokens


def test_equal_lengths_give_the_constant_progress():
    lengths = StageLengths((64, 64, 64), (1000, 5000))
    marks = np.zeros((200, 7), np.int64)
    marks[:, 0], marks[:, 1] = np.arange(200) % 4, np.arange(200) // 4  # partition, number
    for epoch in (0, 1, 2):
        plain = sample_progress_tokens(marks, epoch, 4, 64, epoch_tokens=9000)
        staged = sample_progress_tokens(marks, epoch, 4, 64, 9000, lengths)
        assert np.array_equal(plain, staged)


def test_a_longer_phase_counts_its_samples_longer():
    lengths = StageLengths((64, 128), (770,))  # 770 / 64: the 13th sample reaches it
    index = np.arange(20)
    progress = lengths.progress(index, 0, epoch_tokens=100_000)
    assert np.array_equal(progress[:14], 64 * index[:14])
    assert np.array_equal(progress[13:], 832 + 128 * (index[13:] - 13))
    assert [lengths.length_of(i, 0, 100_000) for i in (0, 12, 13, 19)] == [64, 64, 128, 128]
    assert np.array_equal(np.diff(progress), [lengths.length_of(i, 0, 100_000) for i in index[:-1]])
    # an epoch that starts past the boundary is the long phase throughout, capped at T
    later = lengths.progress(np.array([0, 1, 10_000]), 1, epoch_tokens=100_000)
    assert later.tolist() == [100_000, 100_128, 200_000]
