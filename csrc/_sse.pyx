# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
# cython: binding=False, embedsignature=True
# binding=False makes methods plain builtin methods, which CPython calls faster than the
# cyfunctions Cython 3 makes by default; embedsignature keeps the signatures in help().
"""Compiled SSE scanner of streamed replies: line splitting, ``data:`` payloads, and the
template fast path that counts a chunk without a JSON parse.

``batchbench.drive._sse_py`` is the readable twin with the same algorithm, API and
results; ``batchbench.drive.sse`` states the contract and why the fast path is exact.
"""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.unicode cimport PyUnicode_DecodeUTF8
from libc.string cimport memchr, memcmp

import orjson

from batchbench.drive.replyerror import BAD_CHUNK, ResponseError, server_error_text

cdef object _LOADS = orjson.loads
cdef object _DecodeError = orjson.JSONDecodeError

cdef enum:
    CONTENT = 0
    REASONING = 1  # under reasoning_content
    REASONING_NAMED = 2  # under reasoning (vLLM since 0.17)
    MAX_TEMPLATES = 3
    LEARN_BUDGET = 4  # learnings without a hit in between before learning stops
    HEAD_BYTES = 256  # the stream's first bytes, kept to describe a body that is not SSE

cdef bytes _EMPTY = b""
cdef bytes _DONE = b"[DONE]"
cdef tuple _KEYS = (b"content", b"reasoning_content", b"reasoning")


cdef inline bint _strip_space(char c) noexcept:
    """``bytes.strip()``'s whitespace: space, \\t, \\n, \\r, \\v, \\f."""
    return c == 32 or 9 <= c <= 13


cdef inline bint _json_space(char c) noexcept:
    return c == 32 or c == 9 or c == 10 or c == 13


cdef inline bint _bare_cr(const char *buf, Py_ssize_t n) noexcept:
    """True when a CR is not followed by LF (or ends the read, where the LF may follow)."""
    cdef const char *hit = <const char *>memchr(buf, 13, n)
    cdef Py_ssize_t at
    while hit != NULL:
        at = hit - buf
        if at + 1 >= n or buf[at + 1] != 10:
            return True
        hit = <const char *>memchr(buf + at + 2, 13, n - at - 2) if at + 2 < n else NULL
    return False


cdef object _error_text(bytes payload):
    """The message of an error chunk."""
    return server_error_text(payload)


cdef object _bad_chunk():
    """The error of an invalid JSON chunk."""
    return ResponseError(BAD_CHUNK)


def learn(bytes payload not None, int kind):
    """``(prefix, suffix)`` around the value of the only ``content`` (kind 0),
    ``reasoning_content`` (kind 1) or ``reasoning`` (kind 2) key of a valid, backslash-free
    payload, else None."""
    cdef const char *buf = PyBytes_AS_STRING(payload)
    cdef Py_ssize_t n = PyBytes_GET_SIZE(payload)
    cdef bytes key = <bytes>_KEYS[kind]
    cdef const char *kbuf = PyBytes_AS_STRING(key)
    cdef Py_ssize_t klen = PyBytes_GET_SIZE(key)
    cdef Py_ssize_t i = 0, opening, closing, j, start = -1, end = -1
    cdef bint found = False
    cdef const char *hit
    if memchr(buf, 92, n) != NULL:  # a backslash
        return None
    while i < n:
        hit = <const char *>memchr(buf + i, 34, n - i)
        if hit == NULL:
            break
        opening = hit - buf
        hit = <const char *>memchr(buf + opening + 1, 34, n - opening - 1)
        if hit == NULL:
            return None
        closing = hit - buf
        i = closing + 1
        j = i
        while j < n and _json_space(buf[j]):
            j += 1
        if j >= n or buf[j] != 58:  # not a key
            continue
        if closing - opening - 1 != klen or memcmp(buf + opening + 1, kbuf, klen) != 0:
            continue
        if found:
            return None  # a duplicate key: the parse kept one of them, which is unknown
        found = True
        start = -1
        j += 1
        while j < n and _json_space(buf[j]):
            j += 1
        if j < n and buf[j] == 34:  # the value is a string
            hit = <const char *>memchr(buf + j + 1, 34, n - j - 1)
            if hit != NULL:
                start = j + 1
                end = hit - buf
    if not found or start < 0:
        return None
    return (
        PyBytes_FromStringAndSize(buf, start),
        PyBytes_FromStringAndSize(buf + end, n - end),
    )


cdef class SseScanner:
    """Splits SSE reads into ``data:`` payloads and tallies the chunks.

    A payload that fits a learned template (the stream's own chunk with only its text
    changed) is counted without a JSON parse; any other is parsed with orjson, and may
    become a template. Arrival times are those of the read that completed the line.
    """

    cdef bytes _carry  # the start of a line that has not ended
    cdef list _pieces  # with the reads after it, while none of them ended the line
    cdef bint _skip_lf  # the last read ended in CR: a leading LF is that line's end
    cdef bint _error_event  # inside an ``event: error`` block
    cdef double _last_read
    cdef list _templates
    cdef int _budget
    cdef readonly bint done
    cdef readonly Py_ssize_t chunks
    cdef readonly Py_ssize_t parsed
    cdef readonly list content
    cdef readonly list reasoning
    cdef readonly str reasoning_key  # the field the reasoning came under
    cdef readonly list times
    cdef readonly object usage
    cdef readonly object error  # the server's error message, when it sent one
    cdef readonly object head  # the stream's first bytes

    def __cinit__(self, *args, **kwargs):
        self._carry = _EMPTY
        self._pieces = None
        self._skip_lf = False
        self._error_event = False
        self._last_read = 0.0
        self._templates = []
        self._budget = LEARN_BUDGET
        self.done = False
        self.chunks = 0
        self.parsed = 0
        self.content = []
        self.reasoning = []
        self.reasoning_key = "reasoning_content"
        self.times = []
        self.usage = None
        self.error = None
        self.head = None

    def feed(self, bytes data not None, double arrived):
        """Take one network read; complete lines are scanned now, a partial one waits."""
        cdef const char *buf
        cdef const char *hit
        cdef Py_ssize_t n, start = 0, end
        self._last_read = arrived
        if self.head is None:
            self.head = data[:HEAD_BYTES]
        n = PyBytes_GET_SIZE(data)
        if self._skip_lf:
            self._skip_lf = False
            if n and PyBytes_AS_STRING(data)[0] == 10:
                data = data[1:]
                n -= 1
        if n == 0:
            return
        buf = PyBytes_AS_STRING(data)
        if memchr(buf, 13, n) != NULL and _bare_cr(buf, n):
            # A CR alone ends a line too (the SSE grammar): every ending becomes LF. A
            # read that ends in CR ends a line there; an LF opening the next belongs to it.
            if buf[n - 1] == 13:
                self._skip_lf = True
            data = data.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
            buf = PyBytes_AS_STRING(data)
            n = PyBytes_GET_SIZE(data)
        if memchr(buf, 10, n) == NULL:
            # Part of a line that goes on: kept as a piece, joined once when the line
            # ends (a carry copied on every read would cost the line's length squared).
            if self._pieces is None:
                self._pieces = [self._carry, data] if PyBytes_GET_SIZE(self._carry) else [data]
                self._carry = _EMPTY
            else:
                self._pieces.append(data)
            return
        if self._pieces is not None:
            self._pieces.append(data)
            data = _EMPTY.join(self._pieces)
            self._pieces = None
            buf = PyBytes_AS_STRING(data)
            n = PyBytes_GET_SIZE(data)
        elif PyBytes_GET_SIZE(self._carry):
            data = self._carry + data
            buf = PyBytes_AS_STRING(data)
            n = PyBytes_GET_SIZE(data)
        while start < n:
            hit = <const char *>memchr(buf + start, 10, n - start)
            if hit == NULL:
                break
            end = hit - buf
            self._line(data, start, end, arrived)
            start = end + 1
        if start >= n:
            self._carry = _EMPTY
        else:
            self._carry = PyBytes_FromStringAndSize(buf + start, n - start)

    def flush(self):
        """The stream ended: scan an unterminated last line (at the last read's time)."""
        cdef bytes line = self._carry
        if self._pieces is not None:
            line = _EMPTY.join(self._pieces)
            self._pieces = None
        self._carry = _EMPTY
        self._line(line, 0, PyBytes_GET_SIZE(line), self._last_read)

    cdef int _line(self, bytes data, Py_ssize_t start, Py_ssize_t end, double arrived) except -1:
        cdef const char *buf = PyBytes_AS_STRING(data)
        if end - start < 5 or memcmp(buf + start, b"data:", 5) != 0:
            if end == start or (end - start == 1 and buf[start] == 13):
                self._error_event = False  # a blank line ends the event
            elif end - start >= 6 and memcmp(buf + start, b"event:", 6) == 0:
                self._error_event = data[start + 6 : end].strip() == b"error"
                if self._error_event and self.error is None:
                    self.error = ""  # an error event, whatever its data says
            return 0
        start += 5
        while start < end and _strip_space(buf[start]):
            start += 1
        while end > start and _strip_space(buf[end - 1]):
            end -= 1
        if self._error_event:
            self._server_error(PyBytes_FromStringAndSize(buf + start, end - start))
        elif start < end:
            self._payload(data, start, end, arrived)
        return 0

    cdef int _server_error(self, bytes payload) except -1:
        """The first error the server reported in the stream (later ones are its echoes)."""
        if not self.error:
            self.error = _error_text(payload)
        return 0

    cdef int _payload(
        self, bytes data, Py_ssize_t start, Py_ssize_t end, double arrived
    ) except -1:
        cdef const char *buf = PyBytes_AS_STRING(data)
        cdef Py_ssize_t length = end - start, plen, slen, i, cut
        cdef bytes prefix, suffix
        cdef tuple template
        cdef unsigned char c
        cdef bint plain
        cdef object text
        for template in self._templates:
            prefix = <bytes>template[0]
            suffix = <bytes>template[1]
            plen = PyBytes_GET_SIZE(prefix)
            slen = PyBytes_GET_SIZE(suffix)
            if length < plen + slen:
                continue
            if memcmp(buf + start, PyBytes_AS_STRING(prefix), plen) != 0:
                continue
            cut = end - slen
            if memcmp(buf + cut, PyBytes_AS_STRING(suffix), slen) != 0:
                continue
            plain = True
            i = start + plen
            while i < cut:
                c = <unsigned char>buf[i]
                if c < 32 or c == 34 or c == 92:
                    plain = False
                    break
                i += 1
            if not plain:
                continue
            try:
                text = PyUnicode_DecodeUTF8(buf + start + plen, cut - start - plen, NULL)
            except UnicodeDecodeError:
                break  # orjson rejects it too: the full parse raises
            self._budget = LEARN_BUDGET
            self.chunks += 1
            if cut > start + plen:
                if <int>template[2] == CONTENT:
                    self.content.append(text)
                else:
                    self.reasoning.append(text)
                self.times.append(arrived)
            return 0
        if length == 6 and memcmp(buf + start, b"[DONE]", 6) == 0:
            self.done = True
            return 0
        self._parse(PyBytes_FromStringAndSize(buf + start, length), arrived)
        return 0

    cdef int _parse(self, bytes payload, double arrived) except -1:
        cdef object chunk, usage, choices, choice, delta, content, reasoning
        cdef int kind
        cdef bint has_content, has_reasoning
        try:
            chunk = _LOADS(payload)
        except _DecodeError:
            raise _bad_chunk() from None
        self.chunks += 1
        self.parsed += 1
        if type(chunk) is not dict:
            return 0
        if (<dict>chunk).get("error") is not None:
            self._server_error(payload)
            return 0
        usage = (<dict>chunk).get("usage")
        if usage is not None:
            self.usage = usage
        choices = (<dict>chunk).get("choices")
        if not choices or type(choices) is not list:
            return 0
        choice = (<list>choices)[0]
        delta = (<dict>choice).get("delta") if type(choice) is dict else None
        if type(delta) is not dict:
            return 0
        content = (<dict>delta).get("content")
        reasoning = (<dict>delta).get("reasoning_content")
        kind = REASONING
        if reasoning is None:
            reasoning = (<dict>delta).get("reasoning")
            if type(reasoning) is str:
                kind = REASONING_NAMED
                self.reasoning_key = "reasoning"
        has_content = type(content) is str and len(<str>content) > 0
        has_reasoning = type(reasoning) is str and len(<str>reasoning) > 0
        if has_content:
            self.content.append(content)
        if has_reasoning:
            self.reasoning.append(reasoning)
        if has_content or has_reasoning:
            self.times.append(arrived)
        if usage is not None or self._budget <= 0:
            return 0
        # A template replaces one text; the other must not carry text of its own.
        if type(content) is str and not has_reasoning:
            self._learn(payload, CONTENT)
        elif type(reasoning) is str and not has_content:
            self._learn(payload, kind)
        return 0

    cdef int _learn(self, bytes payload, int kind) except -1:
        self._budget -= 1
        around = learn(payload, kind)
        if around is not None:
            self._templates.insert(0, (around[0], around[1], kind))
            del self._templates[MAX_TEMPLATES:]
        return 0
