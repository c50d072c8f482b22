# Types for compiling exchange.py with Cython (setup.py; the .py runs as it is without it):
# Exchange becomes a native class, so the compiled channel reads its fields and calls its
# route() in C.
cdef class Exchange:
    cdef public object vhost
    cdef public object name
    cdef public object type
    cdef public object durable
    cdef public object auto_delete
    cdef public object internal
    cdef public object arguments
    cdef public object index
    cdef public object alternate
    cdef public Py_ssize_t exchange_dests
    cdef public bint deleted
    cdef public object builtin
    cdef public Py_ssize_t stats_in
    cdef public Py_ssize_t stats_unroutable
    cdef public object policy
    cdef public object operator_policy

    cpdef object route(self, object routing_key, object headers)


cdef class DefaultExchange(Exchange):
    cpdef object route(self, object routing_key, object headers)
