"""Cleaning raw text and splitting it into sentences (English and Chinese).

`normalize` makes text canonical (Unicode NFC, no control characters, tidy whitespace) while
keeping line breaks, because a line break ends a sentence. `split_sentences` cuts after
English end punctuation followed by whitespace (unless the next word starts in lower case,
which keeps "e.g. this" together), after Chinese end punctuation with no space needed, and at
every line break.
"""

import re
import unicodedata

# Line breaks other than "\n".
_LINE_BREAKS = {
    "\r\n": "\n",
    "\r": "\n",
    "\u2028": "\n",
    "\u2029": "\n",
    "\x0b": "\n",
    "\x0c": "\n",
    "\x85": "\n",
}
_LINE_BREAK_RE = re.compile("|".join(re.escape(k) for k in _LINE_BREAKS))
# Unicode category Cc (U+0000-001F, U+007F-009F) except tab and newline; the other line
# breaks among them are mapped to newline before this applies.
_CONTROL_RE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")
_SPACES_RE = re.compile(r"[^\S\n]+")  # any run of whitespace except newline

# English: . ! ? (several allowed, closing quotes/brackets kept with the sentence), then
# whitespace not followed by a lower-case letter. Chinese: 。！？ and closing quotes, no space.
_ENGLISH_END_RE = re.compile(r"""([.!?]+["'\u201d\u2019)\]]*)\s+(?![a-z])""")
_CHINESE_ENDS = "\u3002\uff01\uff1f"
_CHINESE_END_RE = re.compile(r"([\u3002\uff01\uff1f]+[\u201d\u2019\u300d\u300f\uff09]*)")


def normalize(text: str) -> str:
    """Canonical form of `text`: Unicode NFC; line breaks (CR, CRLF, U+2028, ...) become "\\n";
    tabs and other whitespace become one space; other control characters are removed; every
    line is stripped and blank lines are dropped. Returns "" for
    text with nothing visible."""
    text = unicodedata.normalize("NFC", text)
    text = _LINE_BREAK_RE.sub(lambda m: _LINE_BREAKS[m.group(0)], text)
    text = _CONTROL_RE.sub("", text)
    text = _SPACES_RE.sub(" ", text)
    lines = (line.strip() for line in text.split("\n"))
    return "\n".join(line for line in lines if line)


def split_sentences(text: str) -> list[str]:
    """Sentences of normalized `text`, in order, stripped, none empty. A sentence ends at a line
    break, after . ! ? followed by whitespace (and not by a lower-case word), or after 。！？
    (closing quotes stay with their sentence)."""
    sentences: list[str] = []
    chinese = any(end in text for end in _CHINESE_ENDS)  # else the Chinese rule cannot match
    for line in text.split("\n"):
        line = _ENGLISH_END_RE.sub("\\1\n", line)
        if chinese:
            line = _CHINESE_END_RE.sub("\\1\n", line)
        sentences.extend(s.strip() for s in line.split("\n") if s.strip())
    return sentences
