"""Character tokenizer: fixed ids, round trip, unknown characters, padding helpers."""

import numpy as np
import pytest

from fp4rl.rl import tokenizer
from fp4rl.rl.tokenizer import BOS, EOS, PAD, decode, encode, pad_batch


def test_fixed_vocabulary():
    # Pinned ids: changing them invalidates every checkpoint; update only on purpose.
    assert (PAD, BOS, EOS) == (0, 1, 2)
    assert tokenizer.vocab_size == 99
    assert encode("\n 0a~") == [3, 4, 20, 69, 98]
    assert len(set(tokenizer.CHARS)) == len(tokenizer.CHARS)


def test_round_trip():
    text = "a=47. b=a*3-12. c=b-a+5. What is c?\nb=47*3-12=129\nAnswer: \\boxed{-87}"
    assert decode(encode(text)) == text
    everything = "".join(tokenizer.CHARS)
    assert decode(encode(everything)) == everything
    assert decode(encode(text, bos=True, eos=True)) == text
    assert encode("7", bos=True, eos=True) == [BOS, encode("7")[0], EOS]


def test_decode_stops_at_eos_and_skips_pad():
    ids = [PAD, PAD, BOS] + encode("12") + [EOS] + encode("junk")
    assert decode(ids) == "12"
    assert decode(np.array(ids, np.int32)) == "12"
    with pytest.raises(ValueError, match="outside the vocabulary"):
        decode([tokenizer.vocab_size])


@pytest.mark.parametrize("ch", ["\t", "\u03c0", "\u2212", "\u00e9"])
def test_unknown_character_raises_naming_it(ch):
    with pytest.raises(ValueError, match=f"U\\+{ord(ch):04X}\\) at position 2") as e:
        encode("x=" + ch)
    assert repr(ch) in str(e.value)
    assert not tokenizer.is_encodable(ch)


def test_pad_batch_left_and_right():
    seqs = [[5, 6, 7], [8]]
    ids, mask = pad_batch(seqs, 4, side="left")
    np.testing.assert_array_equal(ids, [[0, 5, 6, 7], [0, 0, 0, 8]])
    np.testing.assert_array_equal(mask, [[0, 1, 1, 1], [0, 0, 0, 1]])
    ids, mask = pad_batch(seqs, 4, side="right")
    np.testing.assert_array_equal(ids, [[5, 6, 7, 0], [8, 0, 0, 0]])
    np.testing.assert_array_equal(mask, [[1, 1, 1, 0], [1, 0, 0, 0]])
    assert ids.dtype == np.int32 and mask.dtype == bool
    with pytest.raises(ValueError, match="length=2"):
        pad_batch(seqs, 2, side="left")
    with pytest.raises(ValueError, match="side"):
        pad_batch(seqs, 4, side="middle")
    ids, _ = pad_batch([encode("12"), encode("3")], 4, side="left")
    assert tokenizer.decode_batch(ids) == ["12", "3"]
