# Types for compiling connection.py with Cython (setup.py; the .py runs as it is without it):
# Connection becomes a native class (fields as C struct members), its frame loop typed, and
# send() a C call from the channel that delivers.
import cython

from roarmq.protocol.frames cimport FrameParser


cdef class Connection:
    cdef object __weakref__
    cdef public object broker
    cdef public FrameParser parser
    cdef public object state
    cdef public dict _row
    cdef public dict _unopened
    cdef public dict _receivers
    cdef public object transport
    cdef public object peer
    cdef public object name
    cdef public dict channels
    cdef public Py_ssize_t frame_max
    cdef public Py_ssize_t channel_max
    cdef public object heartbeat
    cdef public dict capabilities
    cdef public object client_properties
    cdef public object user
    cdef public object vhost
    cdef public object permission
    cdef public list exclusive_queues
    cdef public object last_queue
    cdef public object flow
    cdef public bint blocked_notified
    cdef public object tls
    cdef public object auth_mechanism
    cdef public object _backlog
    cdef public object _unparsed
    cdef public list _out
    cdef public Py_ssize_t _out_bytes
    cdef public bint _dirty
    cdef public bint output_held
    cdef public list _confirm_channels
    cdef public bint _received
    cdef public bint _sent
    cdef public object connected_at
    cdef public Py_ssize_t recv_oct
    cdef public Py_ssize_t recv_cnt
    cdef public Py_ssize_t send_oct
    cdef public Py_ssize_t send_cnt
    cdef public Py_ssize_t _missed
    cdef public object _timer
    cdef public bint _cleaned
    cdef public int store_wait
    cdef public object _named

    @cython.locals(i=Py_ssize_t, n=Py_ssize_t, end=Py_ssize_t, receivers=dict)
    cpdef Py_ssize_t _process(self, list events, Py_ssize_t start, Py_ssize_t count)
    cpdef send(self, object data)
    cpdef flush(self)
    cpdef want_flush(self, object channel)
