"""What a pool's engines may be asked to fetch: the media URL policy (policy `pool_defaults.media_urls`,
per pool under `pools.<name>.media_urls`).

The gateway never fetches a media URL itself, but it forwards it, and the engine behind it fetches http(s)
URLs and opens local paths: unchecked, any tenant could make the GPU host read its own files or reach
internal services (the engine as a confused deputy). Every media value of a request (OpenAI content parts
and sglang-omni's top-level lists alike, through `gateway/estimate/media.py: media_source`) passes
`check_media_url` first:

- `data:` URIs: always allowed (the content is in the request).
- bare values (no scheme): base64 content, unless they could name a file. Linux refuses paths of 4096
  bytes or more (PATH_MAX), so a longer value is content whatever it holds; a shorter one must hold only
  base64 characters and no `/` (a small JPEG, `/9j/…`, comes as a data URI instead).
- `http` / `https` URLs, parsed strictly (no credentials, backslashes, percent-encoded hosts, non-ASCII
  hosts, dot segments or whitespace: spellings that parsers disagree on). The host must be named by the
  allow-list — an exact host or a URL prefix (which may name an internal address on purpose), or a
  `*.suffix` wildcard — or be a public host when `allow_public_hosts` is on. Address literals in every
  spelling (decimal, octal, hex, short IPv4; IPv6 with an IPv4 inside it) and local names (`localhost`,
  single labels, `.local`, `.internal` …) are refused unless an exact entry or a prefix names them.
- anything else (`file:`, `ftp:`, `gopher:` …): refused.

Host names are not resolved (docs/decisions/0601-media-url-policy.md): resolving would be network I/O per
request and would still not stop DNS rebinding, since the engine resolves again when it fetches. The
protection for names is the allow-list.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from ipaddress import IPv4Address, IPv6Address
from urllib.parse import unquote

from pydantic import Field, PrivateAttr, field_validator

from gateway.settings.schema import Frozen

PATH_MAX = 4096  # Linux: open() refuses longer paths (ENAMETOOLONG)
_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.\-]*):")
_BASE64_ONLY = re.compile(r"[A-Za-z0-9+= \t\r\n]*")  # without '/': a value with no '/' names no directory
_NAME = re.compile(r"[a-z0-9_\-]+(\.[a-z0-9_\-]+)*")
_UNSAFE = re.compile(r"[\s\\\x00-\x1f\x7f]")
_DOT_SEGMENT = re.compile(r"(^|[/\\])\.{1,2}([/\\]|$)")  # on the decoded path: servers decode it
_DEFAULT_PORT = {"http": 80, "https": 443}
_LOCAL_SUFFIXES = (".localhost", ".local", ".internal", ".localdomain", ".home.arpa")
_LOCAL_NAMES = frozenset({"localhost", "metadata.goog"})

_DENIED_V4 = tuple(
    (ipaddress.IPv4Network(net), what)
    for net, what in (
        ("0.0.0.0/8", "an unspecified address"),
        ("10.0.0.0/8", "a private address"),
        ("100.64.0.0/10", "a shared (carrier-grade NAT) address"),
        ("127.0.0.0/8", "a loopback address"),
        ("169.254.0.0/16", "a link-local (cloud metadata) address"),
        ("172.16.0.0/12", "a private address"),
        ("192.0.0.0/24", "an IETF protocol address"),
        ("192.0.2.0/24", "a documentation address"),
        ("192.88.99.0/24", "a 6to4 relay address"),
        ("192.168.0.0/16", "a private address"),
        ("198.18.0.0/15", "a benchmarking address"),
        ("198.51.100.0/24", "a documentation address"),
        ("203.0.113.0/24", "a documentation address"),
        ("224.0.0.0/4", "a multicast address"),
        ("240.0.0.0/4", "a reserved address"),
    )
)
_DENIED_V6 = tuple(
    (ipaddress.IPv6Network(net), what)
    for net, what in (
        ("::/128", "an unspecified address"),
        ("::1/128", "a loopback address"),
        ("64:ff9b:1::/48", "a local-use NAT64 address"),
        ("100::/64", "a discard address"),
        ("2001::/32", "a Teredo address"),
        ("2001:db8::/32", "a documentation address"),
        ("fc00::/7", "a unique local (private, cloud metadata) address"),
        ("fe80::/10", "a link-local address"),
        ("fec0::/10", "a site-local address"),
        ("ff00::/8", "a multicast address"),
    )
)
_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
_V4_COMPATIBLE = ipaddress.IPv6Network("::/96")


@dataclass(frozen=True, slots=True)
class _Url:
    scheme: str
    host: str  # canonical: lower-case name, dotted IPv4, or bracketed compressed IPv6
    port: int
    path: str
    address: IPv4Address | IPv6Address | None


@dataclass(frozen=True, slots=True)
class _Rules:
    hosts: frozenset[str]
    suffixes: tuple[str, ...]
    prefixes: tuple[_Url, ...]

    @staticmethod
    def parse_entry(entry: str) -> tuple[str, str | _Url]:
        """('host' | 'suffix' | 'prefix', its canonical form); ValueError for an entry that cannot match."""
        text = entry.strip()
        if "://" in text:
            try:
                url = _parse_url(text)
            except MediaUrlRefused as e:
                raise ValueError(f"allow entry {entry!r}: {e}") from None
            if not url.path.endswith("/") or "?" in text or "#" in text:
                raise ValueError(f"allow entry {entry!r}: a URL prefix ends with '/' and has no query")
            return "prefix", url
        if text.count(":") == 1:
            raise ValueError(f"allow entry {entry!r}: a host entry names no port (a URL prefix can)")
        if text.startswith("*."):
            suffix = text[1:].lower().rstrip(".")
            if not _NAME.fullmatch(suffix[1:]) or "." not in suffix[1:]:
                raise ValueError(f"allow entry {entry!r}: a wildcard names a domain, e.g. '*.example.com'")
            return "suffix", suffix
        try:
            host, _ = _canonical_host(text[1:-1] if text.startswith("[") and text.endswith("]") else text)
        except MediaUrlRefused as e:
            raise ValueError(f"allow entry {entry!r}: {e}") from None
        return "host", host

    @classmethod
    def build(cls, entries: tuple[str, ...]) -> _Rules:
        hosts: set[str] = set()
        suffixes: list[str] = []
        prefixes: list[_Url] = []
        for entry in entries:
            kind, form = cls.parse_entry(entry)
            if isinstance(form, _Url):
                prefixes.append(form)
            elif kind == "suffix":
                suffixes.append(form)
            else:
                hosts.add(form)
        return cls(frozenset(hosts), tuple(suffixes), tuple(prefixes))

    def names(self, url: _Url) -> bool:
        """An exact host or a URL prefix names this URL: the operator chose it, internal or not."""
        if url.host in self.hosts:
            return True
        return any(
            (p.scheme, p.host, p.port) == (url.scheme, url.host, url.port) and url.path.startswith(p.path)
            for p in self.prefixes
        )

    def wildcard(self, host: str) -> bool:
        return any(host.endswith(suffix) for suffix in self.suffixes)


class MediaUrlRefused(ValueError):
    """A media value the engine may not be asked to fetch; the message says why, the caller adds where."""


class MediaUrlPolicy(Frozen):
    """Per pool: which remote media the engines may fetch. The default allows none (data URIs and inline
    base64 only)."""

    allow: tuple[str, ...] = Field(
        default=(),
        description="Hosts (`cdn.example.com`, `203.0.113.7`, `[2001:db8::1]`), wildcards (`*.example.com`: "
        "its subdomains) or URL prefixes ending in `/` (`https://media.example.com/public/`). An exact host "
        "or a prefix may name an internal address on purpose; a wildcard never opens one.",
    )
    allow_public_hosts: bool = Field(
        default=False,
        description="Also allow any host that is not local: public address literals and any dotted name. "
        "Names are not resolved, so a public name that points at an internal address passes: use only "
        "where the engines cannot reach internal networks.",
    )
    _rules: _Rules = PrivateAttr()

    @field_validator("allow")
    @classmethod
    def _parse(cls, entries: tuple[str, ...]) -> tuple[str, ...]:
        for entry in entries:
            _Rules.parse_entry(entry)  # raises ValueError naming the entry
        return entries

    def model_post_init(self, context: object) -> None:
        self._rules = _Rules.build(self.allow)


def check_media_url(value: str, policy: MediaUrlPolicy) -> None:
    """Raise MediaUrlRefused unless `value` (a media item's URL or inline content) may reach the engine."""
    if value.startswith("data:"):
        return
    scheme = _SCHEME.match(value.lstrip())
    if scheme is None:
        _check_bare(value)
        return
    name = scheme.group(1).lower()
    if name == "data":
        raise MediaUrlRefused("a data URI starts with lower-case 'data:'")
    if name not in _DEFAULT_PORT:
        raise MediaUrlRefused(f"'{name}:' URLs are not allowed (only data:, http: and https:)")
    url = _parse_url(value)
    rules = policy._rules
    if rules.names(url):
        return
    local = _local(url)
    if local is not None:
        raise MediaUrlRefused(f"{url.host} is {local}; the engine may not be sent there")
    if rules.wildcard(url.host) or policy.allow_public_hosts:
        return
    raise MediaUrlRefused(f"host {url.host} is not on this pool's media URL allow-list")


def _check_bare(value: str) -> None:
    if len(value) >= PATH_MAX:
        return  # no path can be this long: the engine can only decode it
    if "/" in value or not _BASE64_ONLY.fullmatch(value):
        raise MediaUrlRefused(
            "a bare value this short could name a file on the engine's host; send inline media as a "
            "data: URI (data:<type>;base64,…)"
        )


def _parse_url(value: str) -> _Url:
    """An http(s) URL split strictly; anything parsers could read two ways is refused."""
    if _UNSAFE.search(value):
        raise MediaUrlRefused("URL contains whitespace, a backslash or a control character")
    scheme, sep, rest = value.partition("://")
    scheme = scheme.lower()
    if not sep or scheme not in _DEFAULT_PORT:
        raise MediaUrlRefused("not an http(s) URL")
    end = min((i for i in (rest.find(c) for c in "/?#") if i >= 0), default=len(rest))
    authority, tail = rest[:end], rest[end:]
    if "@" in authority:
        raise MediaUrlRefused("URL carries credentials (user@host)")
    if "%" in authority:
        raise MediaUrlRefused("URL host is percent-encoded")
    if authority.startswith("["):
        close = authority.find("]")
        if close < 0:
            raise MediaUrlRefused("unterminated IPv6 address")
        raw_host, port_text = authority[1:close], authority[close + 1 :]
    else:
        raw_host, colon, port_text = authority.partition(":")
        port_text = colon + port_text
    if port_text and not re.fullmatch(r":\d{1,5}", port_text):
        raise MediaUrlRefused("URL port is not a number")
    port = int(port_text[1:]) if port_text else _DEFAULT_PORT[scheme]
    if port > 65535:
        raise MediaUrlRefused("URL port is out of range")
    host, address = _canonical_host(raw_host, bracketed=authority.startswith("["))
    path = tail.split("?", 1)[0].split("#", 1)[0] or "/"
    if _DOT_SEGMENT.search(unquote(path)):
        raise MediaUrlRefused("URL path has '.' or '..' segments")
    return _Url(scheme, host, port, path, address)


def _canonical_host(raw: str, bracketed: bool = False) -> tuple[str, IPv4Address | IPv6Address | None]:
    if not raw:
        raise MediaUrlRefused("URL has no host")
    if not raw.isascii():
        raise MediaUrlRefused("URL host is not ASCII (send its punycode form)")
    if bracketed or ":" in raw:
        try:
            v6 = IPv6Address(raw)
        except ValueError:
            raise MediaUrlRefused(f"malformed IPv6 address {raw!r}") from None
        return f"[{v6.compressed}]", v6
    name = raw.lower()
    name = name[:-1] if name.endswith(".") else name
    v4 = _ipv4(name)
    if v4 is not None:
        return str(v4), v4
    if not _NAME.fullmatch(name):
        raise MediaUrlRefused(f"malformed host name {raw!r}")
    return name, None


def _number(part: str) -> int | None:
    """One IPv4 part as inet_aton and URL parsers read it: 0x… hex, 0… octal, else decimal."""
    if part[:2].lower() == "0x":
        digits, base = part[2:] or "0", 16
    elif len(part) > 1 and part.startswith("0"):
        digits, base = part[1:], 8
    else:
        digits, base = part, 10
    try:
        return int(digits, base) if digits.isalnum() else None
    except ValueError:
        return None


def _ipv4(name: str) -> IPv4Address | None:
    """The address a host that ends in a number spells (127.1, 2130706433, 0x7f.0.0.1, 0177.0.0.1 …);
    None for a name. A number form that is no address is refused: some resolver would read it somehow."""
    parts = name.split(".")
    last = parts[-1]
    if not (last.isdigit() or (last[:2] == "0x" and all(c in "0123456789abcdef" for c in last[2:]))):
        return None
    numbers = [_number(p) if p else None for p in parts]
    if len(parts) > 4 or any(n is None for n in numbers):
        raise MediaUrlRefused(f"malformed IPv4 address {name!r}")
    *head, tail = [n for n in numbers if n is not None]
    if any(n > 255 for n in head) or tail >= 256 ** (5 - len(parts)):
        raise MediaUrlRefused(f"malformed IPv4 address {name!r}")
    value = tail
    for i, n in enumerate(head):
        value += n << (8 * (3 - i))
    return IPv4Address(value)


def _embedded_v4(v6: IPv6Address) -> IPv4Address | None:
    """The IPv4 address an IPv6 one carries (mapped, 6to4, NAT64, IPv4-compatible), which is where a
    packet to it ends up."""
    if v6.ipv4_mapped is not None:
        return v6.ipv4_mapped
    if v6.sixtofour is not None:
        return v6.sixtofour
    if v6 in _NAT64 or (v6 in _V4_COMPATIBLE and int(v6) > 1):
        return IPv4Address(int(v6) & 0xFFFFFFFF)
    return None


def _local(url: _Url) -> str | None:
    """Why this URL's host is local (an address or a name inside the engine's network), or None."""
    address = url.address
    if isinstance(address, IPv6Address):
        inner = _embedded_v4(address)
        if inner is not None:
            what = _denied(inner)
            return f"{what} ({inner} inside an IPv6 address)" if what else None
        return next((what for net, what in _DENIED_V6 if address in net), None)
    if isinstance(address, IPv4Address):
        return _denied(address)
    host = url.host
    if host in _LOCAL_NAMES or host.endswith(_LOCAL_SUFFIXES):
        return "a local name"
    if "." not in host:
        return "a single-label name (resolved inside the engine's network)"
    return None


def _denied(address: IPv4Address) -> str | None:
    return next((what for net, what in _DENIED_V4 if address in net), None)
