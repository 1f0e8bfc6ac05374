"""UTF-8 helpers and LSP position units.

Documents are kept as UTF-8 bytes (what tree-sitter parses); LSP positions
count characters in the negotiated encoding. Text from JSON may carry lone
surrogates, so encoding uses ``surrogatepass`` and never raises.
"""

from __future__ import annotations

UTF8 = "utf-8"
UTF16 = "utf-16"
UTF32 = "utf-32"
ENCODINGS = (UTF8, UTF16, UTF32)


def encode(text: str) -> bytes:
    return text.encode("utf-8", "surrogatepass")


def decode(data: bytes) -> str:
    try:
        return data.decode("utf-8", "surrogatepass")
    except UnicodeDecodeError:
        # Only reachable if a slice cut a character; never lose the request over it.
        return data.decode("utf-8", "replace")


def units_to_bytes(line: bytes, units: int, encoding: str) -> int:
    """Byte offset in ``line`` of a character offset counted in ``encoding`` units.

    ``line`` has no terminator. Past the end clamps to the line length (as the
    spec says); an offset inside a character rounds down to its start.
    """
    if units <= 0:
        return 0
    if line.isascii():
        return min(units, len(line))
    if encoding == UTF8:
        n = min(units, len(line))
        while 0 < n < len(line) and (line[n] & 0xC0) == 0x80:
            n -= 1
        return n
    text = decode(line)
    if encoding == UTF32:
        return len(encode(text[:units]))
    # UTF-16: slice code units. A cut through a surrogate pair leaves a lone
    # high surrogate that the text does not have: drop it (round down).
    head = text.encode("utf-16-le", "surrogatepass")[: 2 * units].decode("utf-16-le", "surrogatepass")
    if not text.startswith(head):
        head = head[:-1]
    return len(encode(head))


def bytes_to_units(line: bytes, nbytes: int, encoding: str) -> int:
    """Character offset, in ``encoding`` units, of byte offset ``nbytes`` in ``line``."""
    nbytes = max(0, min(nbytes, len(line)))
    if encoding == UTF8 or line.isascii():
        return nbytes
    try:
        head = line[:nbytes].decode("utf-8", "surrogatepass")
    except UnicodeDecodeError:  # nbytes inside a character: count the whole ones
        head = line[:nbytes].decode("utf-8", "ignore")
    if encoding == UTF32:
        return len(head)
    return len(head.encode("utf-16-le", "surrogatepass")) // 2
