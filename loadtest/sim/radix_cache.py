"""SGLang's radix cache as the simulator models it (`--radix-cache`): finished prompts stay in the KV pool
and a new prompt that starts the same way prefills only the rest.

A prompt is a chain of pages (`PromptPages`, built by tokens.py while it counts): per message its template
and role, its text in pieces of `PAGE_CHARS` characters, every image or audio clip one page named by the
hash of its data (SGLang's multimodal radix keys hash the item's content the same way). Page `i`'s key
hashes page `i` with key `i-1`: equal keys are equal prompts up to there. What SGLang does and this does:
- Admission matches the longest cached prefix (at least the prompt's last token is always computed) and
  locks it while the request runs; the request prefills the rest, its encoders run only on the media
  after the match, and its usage reports the match as `cached_tokens` (with `--enable-cache-report`).
- A finished request's prompt joins the tree; what is not locked is evictable: free for admission, and
  evicted least recently used first (a chain's deepest pages first) when the pool needs the room.
- Used tokens are those running requests hold plus the locked prefix; evictable ones are apart
  (`/v1/loads`' `kv_evictable_tokens`), as SGLang reports them.
What it does not: the answer's tokens are not cached (SGLang caches them too, so a next turn that repeats
the answer matches further there), and pages are whole (SGLang matches to the token).
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

PAGE_CHARS = 256  # text characters per page: a prefix is found to about 64 tokens


@dataclass(frozen=True, slots=True)
class Page:
    key: bytes
    tokens: int
    encoder: int = 0  # of them, produced by an encoder (image, audio)


@dataclass(slots=True)
class PromptPages:
    """The pages of one prompt, built in order."""

    pages: list[Page] = field(default_factory=list)

    def add(self, content: bytes, tokens: int, encoder: int = 0) -> None:
        last = self.pages[-1].key if self.pages else b""
        key = hashlib.blake2b(last + content, digest_size=8).digest()
        self.pages.append(Page(key, tokens, encoder))

    def text(self, text: str, count: Callable[[str], int]) -> None:
        """`text` in pages of PAGE_CHARS; `count` the tokens of a string (counted cumulatively, so the pages
        add up to the whole text's count)."""
        before = 0
        for end in range(PAGE_CHARS, len(text) + PAGE_CHARS, PAGE_CHARS):
            upto = count(text[:end])
            self.add(text[end - PAGE_CHARS : end].encode(), upto - before)
            before = upto


@dataclass(slots=True)
class _Node:
    tokens: int
    encoder: int
    refs: int = 0


@dataclass(frozen=True, slots=True)
class Match:
    pages: int
    tokens: int
    encoder: int


NO_MATCH = Match(0, 0, 0)


class RadixCache:
    def __init__(self) -> None:
        self._nodes: OrderedDict[bytes, _Node] = OrderedDict()  # least recently used first
        self.size = 0  # tokens in the tree
        self.locked = 0  # of them, held by running requests
        self.hit_tokens = 0  # prompt tokens served from the tree, and all prompt tokens admitted
        self.prompt_tokens = 0

    @property
    def evictable(self) -> int:
        return self.size - self.locked

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    def match(self, pages: list[Page], prompt_tokens: int) -> Match:
        """The longest cached prefix of `pages` that leaves the prompt's last token to compute."""
        tokens = encoder = n = 0
        for page in pages:
            if page.key not in self._nodes or tokens + page.tokens >= prompt_tokens:
                break
            tokens, encoder, n = tokens + page.tokens, encoder + page.encoder, n + 1
        return Match(n, tokens, encoder) if n else NO_MATCH

    def lock(self, pages: list[Page], match: Match, prompt_tokens: int) -> int:
        """A request admitted with `match`: hold its pages (most recent, deepest first) and count it;
        returns the tokens that stopped being evictable."""
        self.prompt_tokens += prompt_tokens
        self.hit_tokens += match.tokens
        return self._ref(pages[: match.pages], +1)

    def unlock(self, pages: list[Page], match: Match) -> int:
        """The request ended or lost its KV: returns the tokens that became evictable again."""
        return self._ref(pages[: match.pages], -1)

    def _ref(self, pages: list[Page], step: int) -> int:
        moved = 0
        for page in reversed(pages):
            node = self._nodes.get(page.key)
            if node is None:
                continue
            if (node.refs == 0) if step > 0 else (node.refs == 1):
                moved += node.tokens
            node.refs += step
            self._nodes.move_to_end(page.key)
        self.locked += moved if step > 0 else -moved
        return moved

    def insert(self, pages: list[Page]) -> int:
        """A finished prompt joins the tree (its pages the most recent, deepest first); returns the tokens
        added (the pages it did not hold already)."""
        added = 0
        for page in reversed(pages):
            node = self._nodes.get(page.key)
            if node is None:
                self._nodes[page.key] = _Node(page.tokens, page.encoder)
                added += page.tokens
            else:
                self._nodes.move_to_end(page.key)
        self.size += added
        return added

    def evict(self, tokens: int) -> int:
        """Free at least `tokens` (as far as unlocked pages allow), least recently used first; returns the
        tokens freed."""
        freed = 0
        for key in list(self._nodes):
            if freed >= tokens:
                break
            node = self._nodes[key]
            if node.refs:
                continue
            del self._nodes[key]
            freed += node.tokens
        self.size -= freed
        return freed
