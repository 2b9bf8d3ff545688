"""A1111's extra-network tags in a prompt (``<lora:film:0.6>``, ``<hypernet:h:1>``), found in
linear time.

A1111 finds them with the regular expression ``<(\\w+):([^>]+)>``. Python's backtracking engine
takes quadratic time on it (each ``<`` scans to the end of the text for a ``>`` that never comes:
``'<a:' * 20000`` took 21-28 s, issue 30), so this scanner reads the text once instead: at each
``<`` it reads the word and the ``:``, then the body up to the next ``>``, found once and reused
by every ``<`` before it. It finds exactly the matches ``re.finditer`` finds with that pattern.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Tag:
    kind: str  # "lora", "lyco", "hypernet", ...
    body: str  # what follows the first ':' ("film:0.6")
    start: int  # the tag's span in the prompt
    end: int

    @property
    def text(self) -> str:
        return f"<{self.kind}:{self.body}>"


def _is_word(char: str) -> bool:
    return char.isalnum() or char == "_"  # \w of Python's str patterns


def find_tags(prompt: str) -> list[Tag]:
    """Every ``<kind:body>`` tag, left to right, not overlapping (as ``re.finditer``)."""
    tags: list[Tag] = []
    end = len(prompt)
    next_close = -2  # position of the next '>' at or after the scan point; -1: there is none
    position = prompt.find("<")
    while position != -1:
        word_end = position + 1
        while word_end < end and _is_word(prompt[word_end]):
            word_end += 1
        if word_end == position + 1 or word_end >= end or prompt[word_end] != ":":
            position = prompt.find("<", position + 1)
            continue
        if next_close != -1 and next_close <= word_end:
            next_close = prompt.find(">", word_end + 1)
        if next_close == -1:  # no '>' after here: no later '<' can close either
            break
        if next_close == word_end + 1:  # "<a:>": the body needs one character
            position = prompt.find("<", position + 1)
            continue
        tags.append(Tag(prompt[position + 1 : word_end], prompt[word_end + 1 : next_close], position, next_close + 1))
        position = prompt.find("<", next_close + 1)
    return tags


def remove_tags(prompt: str, tags: list[Tag]) -> str:
    """``prompt`` without ``tags`` (found in it by ``find_tags``)."""
    parts: list[str] = []
    last = 0
    for tag in tags:
        parts.append(prompt[last : tag.start])
        last = tag.end
    parts.append(prompt[last:])
    return "".join(parts)
