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


# Marks where one document ends and the next begins when many are cleaned as one string: a
# private-use character, a starter that composes with nothing (so NFC and every rule above
# treat the documents on either side of it as they treat them apart), on a line of its own.
_DOCUMENT_BREAK = "\ue000"
_JOINER = f"\n{_DOCUMENT_BREAK}\n"
_LINE_EDGES_RE = re.compile(r" \n[ \n]*|\n[ \n]+")  # spaces and blank lines at a line break
# The English rule once every space is a single " ": a space after end punctuation and up to
# three closing quotes/brackets, matched from the space (a fast literal scan) and replaced
# without a group to copy back; text with more closers in a row takes the rule itself.
_CLOSERS = "[\"'\u201d\u2019)\\]]"
_ENGLISH_SPACE_RE = re.compile(
    " (?:" + "|".join(f"(?<=[.!?]{_CLOSERS * n} )" for n in range(4)) + ")(?![a-z])"
)
_MANY_CLOSERS_RE = re.compile(f"[.!?]{_CLOSERS}{{4}}")


def _normalized_joined(texts: list[str]) -> str | None:
    """`normalize` of every text of `texts` at once: their normalized forms joined by lines
    holding only the document-break marker (a document that normalizes to nothing still has
    its marker lines); None when a text holds the marker itself."""
    joined = _JOINER.join(texts)
    if joined.count(_DOCUMENT_BREAK) != len(texts) - 1:
        return None
    text = unicodedata.normalize("NFC", joined)
    # Printable apart from its line breaks: no other line break, control character, tab or
    # other space than " " (all unprintable), so only runs of spaces are left to collapse.
    printable = text.replace("\n", " ").replace(_DOCUMENT_BREAK, " ").isprintable()
    if not printable:
        text = _LINE_BREAK_RE.sub(lambda m: _LINE_BREAKS[m.group(0)], text)
        text = _CONTROL_RE.sub("", text)
        text = _SPACES_RE.sub(" ", text)
    while "  " in text:
        text = text.replace("  ", " ")
    if " \n" in text or "\n " in text or "\n\n" in text:
        text = _LINE_EDGES_RE.sub("\n", text)  # every line stripped, blank lines dropped
    return text


def normalize_many(texts: list[str]) -> list[str]:
    """`[normalize(t) for t in texts]`, with the regular expressions run once over all the
    texts joined (for short documents several times faster)."""
    text = _normalized_joined(texts)
    if text is None:  # a text holds the marker itself
        return [normalize(t) for t in texts]
    return [piece.strip(" \n") for piece in text.split(_DOCUMENT_BREAK)]


def documents_sentences(texts: list[str]) -> tuple[list[str], list[int]]:
    """`split_sentences(normalize(t))` for every text of `texts`, as one list of all their
    sentences in order and the number of sentences of each text: the same sentences as
    text by text, with the regular expressions run once over all the texts joined (for
    short documents about 3x faster than a call per text)."""
    text = _normalized_joined(texts)
    if text is None:  # a text holds the marker itself
        per_text = [split_sentences(normalize(t)) for t in texts]
        return [s for sentences in per_text for s in sentences], [len(s) for s in per_text]
    if _MANY_CLOSERS_RE.search(text):
        text = _ENGLISH_END_RE.sub("\\1\n", text)
    else:  # a line break after end punctuation already ends a sentence
        text = _ENGLISH_SPACE_RE.sub("\n", text)
    if any(end in text for end in _CHINESE_ENDS):
        text = _CHINESE_END_RE.sub("\\1\n", text)
    pieces = [s for s in (piece.strip() for piece in text.split("\n")) if s]
    breaks = [i for i, piece in enumerate(pieces) if piece == _DOCUMENT_BREAK]
    counts = [b - a - 1 for a, b in zip([-1, *breaks], [*breaks, len(pieces)], strict=True)]
    if len(counts) != len(texts):  # cannot happen for texts without the marker
        raise AssertionError("documents_sentences lost a document boundary")
    if not breaks:
        return pieces, counts
    return [piece for piece in pieces if piece != _DOCUMENT_BREAK], counts
