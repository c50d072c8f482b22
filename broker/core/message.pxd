# Types for compiling message.py with Cython (setup.py; the .py runs as it is without it):
# Message becomes a native class, its fields C struct members, so the compiled channel and
# queue read them without a dictionary or descriptor lookup.
import cython

from roarmq.protocol.frames cimport ContentHeader


cdef bint _COMPILED

cdef extern from "Python.h":
    void PyObject_GC_UnTrack(object o)


cdef class Message:
    cdef public object exchange
    cdef public object routing_key
    cdef public ContentHeader header
    cdef public object body
    cdef public Py_ssize_t size
    cdef public long flags
    cdef public bint persistent
    cdef public long priority
    cdef public object expiration_ms
    cdef public object store_id
