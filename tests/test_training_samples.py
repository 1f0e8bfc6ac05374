"""training/samples.py: every FIM split is a real cut of the text (prefix + middle + suffix == text)."""

from __future__ import annotations

import random

import pytest

from training.samples import split_middle

TEXTS = {
    "blank lines": "def f(x):\n\n    y = x + 1\n\n\n    return y\n",
    "whitespace-only lines": "class A:\n    \n    def m(self):\n        \n        return 1\n",
    "crlf": "a = 1\r\n\r\nb = 2\r\nc = 3\r\n",
    "short": "x = 1\n",
}


@pytest.mark.parametrize("name", sorted(TEXTS))
def test_split_is_a_cut_of_the_text(name: str) -> None:
    text = TEXTS[name]
    rng = random.Random(0)
    for _ in range(2000):
        prefix, middle, suffix = split_middle(text, rng)
        assert prefix + middle + suffix == text


def test_cursor_inside_a_line_never_starts_past_the_line() -> None:
    """A cursor on a blank line used to land after its line break with the middle's end before it:
    the suffix repeated the break and the middle was empty."""
    text = TEXTS["blank lines"]
    rng = random.Random(1)
    for _ in range(2000):
        prefix, middle, suffix = split_middle(text, rng)
        assert len(prefix) + len(middle) + len(suffix) == len(text)
        if middle == "":
            # an empty middle only where the cursor sits at the end of a line's content
            assert suffix == "" or suffix[0] in "\r\n" or prefix == ""


def test_end_of_text_only_where_the_file_ends() -> None:
    """Plain samples of a file cut into chunks: only the last chunk ends with the end-of-text
    token (one after every chunk taught the model to stop at any line break)."""
    from quickdraft.prompt_format import ENDOFTEXT, FIM_MIDDLE
    from training.samples import MAX_CHARS, samples

    whole = "".join(f"def f{i}(x):\n    return x + {i}\n\n" for i in range(600))
    assert len(whole) > 3 * MAX_CHARS
    texts = list(samples({"dist": [("pkg/long.py", whole)]}, seed=0))
    plain = [t for t in texts if FIM_MIDDLE not in t]
    assert plain, "some chunks become plain samples"
    tails = [t for t in plain if t.endswith(ENDOFTEXT)]
    # at most the file's last chunk, and that one only if it was rendered plain
    assert len(tails) <= 1
    assert all(t.removesuffix(ENDOFTEXT).endswith(whole[-40:]) for t in tails)
