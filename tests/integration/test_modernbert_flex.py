"""ModernBERT's FlexAttention path (compiled by torch on first use, tens of seconds on a CPU):
packed rows equal to the documents encoded alone, and the padded and unpadded batches equal
to SDPA on the padded grid (the cases of tests/unit/test_modernbert.py, for flex)."""

import pytest
from test_modernbert import (
    test_flex_and_unpadded_paths_equal_the_padded_sdpa_grid as padded_grid_case,
)
from test_modernbert import test_packed_rows_equal_documents_encoded_alone as packed_case


def test_packed_rows_equal_documents_encoded_alone_under_flex():
    packed_case("flex")


@pytest.mark.parametrize("unpad", ["false", "true"])
def test_flex_equals_the_padded_sdpa_grid(unpad):
    padded_grid_case("flex", unpad)
