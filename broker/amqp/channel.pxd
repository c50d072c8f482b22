# Types for compiling channel.py with Cython (setup.py; the .py runs as it is without it):
# Consumer and Channel become native classes whose fields are C struct members, and the
# methods on a message's way (publish, route, deliver, hand out, ack) C calls between them.
import cython

from roarmq.broker.amqp.connection cimport Connection
from roarmq.broker.core.exchange cimport Exchange
from roarmq.broker.core.message cimport Message
from roarmq.broker.core.queue cimport Entry, Queue, enqueue
from roarmq.broker.routing.graph cimport route_key


cdef class Consumer:
    cdef public Channel channel
    cdef public Queue queue
    cdef public object tag
    cdef public bint no_ack
    cdef public bint exclusive
    cdef public object priority
    cdef public Py_ssize_t prefetch
    cdef public Py_ssize_t unacked
    cdef public object arguments

    cpdef bint has_credit(self)


cdef class Channel:
    cdef object __weakref__
    cdef public Connection conn
    cdef public object id
    cdef public object vhost
    cdef public object state
    cdef public dict _row
    cdef public bint flow_active
    cdef public bint can_deliver
    cdef public dict consumers
    cdef public dict unacked
    cdef public Py_ssize_t unacked_bytes
    cdef public Py_ssize_t delivery_tag
    cdef public Py_ssize_t prefetch_count
    cdef public Py_ssize_t prefetch_global
    cdef public Py_ssize_t prefetch_size
    cdef public bint confirm
    cdef public Py_ssize_t publish_seq
    cdef public list _acks_ready
    cdef public dict _acks_waiting
    cdef public Py_ssize_t _acked_sent
    cdef public object tx
    cdef public object reply_key
    cdef public Py_ssize_t stats_published
    cdef public Py_ssize_t stats_no_ack
    cdef public Py_ssize_t stats_acked
    cdef public list stats
    cdef public dict _publish_exchanges
    cdef public object _shortest_timeout
    cdef public list _marks
    cdef public object _sweep

    @cython.locals(queue=Queue)
    cpdef deliver(self, Consumer consumer, Entry entry)
    cpdef tuple _hand_out(self, Entry entry, bint no_ack)
    @cython.locals(exchange=Exchange, msg=Message)
    cpdef _basic_publish(self, object method, object header, object body)
    @cython.locals(queue=Queue)
    cpdef _route(self, Exchange exchange, Message msg, bint mandatory, Py_ssize_t seq)
    cpdef _confirmed(self, Py_ssize_t seq, bint ok)

    # A consumer's basic.ack, once per message: typed so the entry's fields are C reads.
    @cython.locals(entry=Entry, queue=Queue)
    cpdef _ack_one(self, object tag)
    @cython.locals(size=Py_ssize_t, consumer=Consumer, queue=Queue)
    cpdef _release(self, Entry entry)
