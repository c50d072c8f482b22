# Types for compiling frames.py with Cython (setup.py): the .py stays the one source, which
# runs as it is without a compiler; this file only declares what C may take for granted.
# ContentHeader and FrameParser become native classes whose fields are C struct members, and
# the parser's locals C integers, so its byte reads compile to loads from the buffer.
import cython


cdef class ContentHeader:
    cdef public object class_id
    cdef public object body_size
    cdef public object raw
    cdef public object _properties


cdef (Py_ssize_t, Py_ssize_t, Py_ssize_t) _frame_head(bytes data, Py_ssize_t at)

@cython.locals(high=Py_ssize_t)
cdef Py_ssize_t _u32(bytes data, Py_ssize_t at)

@cython.locals(header=ContentHeader)
cdef ContentHeader _header(int class_id, Py_ssize_t body_size, bytes raw)

@cython.locals(n=Py_ssize_t, at=Py_ssize_t, key_end=Py_ssize_t, bits=Py_ssize_t)
cdef object _decode_publish(bytes data, Py_ssize_t start, Py_ssize_t end)

@cython.locals(high=cython.ulonglong)
cdef object _decode_ack(bytes data, Py_ssize_t start, Py_ssize_t end)


cdef class FrameParser:
    cdef public Py_ssize_t frame_max
    cdef public object max_body_size
    cdef public bint _expect_header
    cdef public object _tail
    cdef public Py_ssize_t _need
    cdef public dict _pending
    cdef public object _error

    @cython.locals(
        events=list,
        pos=Py_ssize_t,
        end=Py_ssize_t,
        need=Py_ssize_t,
        pending=dict,
        frame_max=Py_ssize_t,
        max_payload=Py_ssize_t,
        max_body=Py_ssize_t,
        kind=Py_ssize_t,
        channel=Py_ssize_t,
        size=Py_ssize_t,
        nxt=Py_ssize_t,
        index=Py_ssize_t,
        hkind=Py_ssize_t,
        hchannel=Py_ssize_t,
        class_id=Py_ssize_t,
        weight=Py_ssize_t,
        body_high=Py_ssize_t,
        bkind=Py_ssize_t,
        bchannel=Py_ssize_t,
        hend=Py_ssize_t,
        body_size=Py_ssize_t,
        bend=Py_ssize_t,
    )
    cpdef list _parse(self, bytes data)


# encode_deliver's common case, compiled only (see the end of frames.py).
from cpython.bytes cimport PyBytes_AS_STRING
from cpython.unicode cimport PyUnicode_DATA, PyUnicode_GET_LENGTH
from libc.string cimport memcpy


cdef bint _COMPILED

cdef extern from "Python.h":
    bint PyUnicode_IS_ASCII(object o)
    void PyObject_GC_UnTrack(object o)

cdef extern from *:
    """
    #define roarmq_bytes_of_size(n) PyBytes_FromStringAndSize(NULL, (n))
    """
    bytes _bytes_of_size "roarmq_bytes_of_size" (Py_ssize_t n)


@cython.locals(
    tag_len=Py_ssize_t,
    ex_len=Py_ssize_t,
    key_len=Py_ssize_t,
    raw_len=Py_ssize_t,
    size=Py_ssize_t,
    method_size=Py_ssize_t,
    total=Py_ssize_t,
    at=Py_ssize_t,
    p="char *",
)
cdef object _deliver_frames(
    Py_ssize_t channel,
    object tag,
    unsigned long long delivery_tag,
    bint redelivered,
    object exchange,
    object routing_key,
    object raw,
    object body,
)

cdef void _put16(char *p, Py_ssize_t at, unsigned long long value)
cdef void _put32(char *p, Py_ssize_t at, unsigned long long value)
