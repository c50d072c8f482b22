# Types for compiling queue.py with Cython (setup.py; the .py runs as it is without it):
# Entry and Queue become native classes whose fields are C struct members. Consumers stay
# untyped here: a queue takes anything with has_credit(), priority, exclusive and
# channel.deliver() (tests/core/test_queue_unit.py drives it with fakes).
import cython

from roarmq.broker.core.message cimport Message


cdef class Entry:
    cdef public Message msg
    cdef public object seq
    cdef public bint redelivered
    cdef public object expires_at
    cdef public Queue queue
    cdef public object consumer
    cdef public Py_ssize_t delivery_count
    cdef public bint marked


cdef class _ConsumerGroup:
    cdef public object priority
    cdef public list members
    cdef public Py_ssize_t rr


cdef class Queue:
    # What a message's way reads (publish, hand-out, ack, settle) first: Cython lays the
    # fields out in this order, so a queue met once per message (101,000 queues behind a
    # topic exchange) costs the fewest cache lines. The rest as queue.py sets them.
    cdef public bint deleted
    cdef public bint _reject_overflow
    cdef public bint _limited
    cdef public bint _saturated
    cdef public Py_ssize_t _seq
    cdef public Py_ssize_t consumer_count
    cdef public object _only
    cdef public object ready
    cdef public Py_ssize_t ready_bytes
    cdef public Py_ssize_t unacked
    cdef public Py_ssize_t unacked_bytes
    cdef public list _groups
    cdef public object single_active
    cdef public object message_ttl
    cdef public Py_ssize_t _timed
    cdef public object throttled
    cdef public object store
    cdef public object vhost
    cdef public Py_ssize_t stats_published
    cdef public Py_ssize_t stats_delivered
    cdef public Py_ssize_t stats_acked
    cdef public object _expiry_timer

    cdef public object name
    cdef public object durable
    cdef public object exclusive_owner
    cdef public object auto_delete
    cdef public object arguments
    cdef public object queue_type
    cdef public object expires
    cdef public object max_length
    cdef public object max_length_bytes
    cdef public object overflow
    cdef public object dlx
    cdef public object dlrk
    cdef public object max_priority
    cdef public object delivery_limit
    cdef public object retry_type
    cdef public object retry_min
    cdef public object retry_max
    cdef public list _retrying
    cdef public object _retry_timer
    cdef public object dlx_strategy
    cdef public list _dead_held
    cdef public object _dead_timer
    cdef public object consumer_timeout
    cdef public object _expiry_at
    cdef public object _idle_timer
    cdef public bint _had_consumers
    cdef public bint _dispatch_scheduled
    cdef public Py_ssize_t stats_dead_lettered
    cdef public Py_ssize_t stats_get
    cdef public Py_ssize_t stats_get_no_ack
    cdef public Py_ssize_t stats_get_empty
    cdef public Py_ssize_t stats_redelivered
    cdef public Py_ssize_t stats_no_ack
    cdef public Py_ssize_t persistent
    cdef public Py_ssize_t persistent_bytes
    cdef public object store_id
    cdef public bint counts_deliveries
    cdef public object memory_limit
    cdef public object _account
    cdef public object _args
    cdef public object policy
    cdef public object operator_policy
    cdef public object effective_policy
    cdef public double _blocked_at
    cdef public double blocked_seconds

    cpdef bint publish(self, Message msg)
    @cython.locals(
        group=_ConsumerGroup, members=list, n=Py_ssize_t, start=Py_ssize_t, k=Py_ssize_t,
        idx=Py_ssize_t,
    )
    cpdef object _next_consumer(self)
    cpdef lend(self, Py_ssize_t size)
    cpdef take_back(self, Py_ssize_t count, Py_ssize_t size)
    cpdef ack(self, Entry entry)
    cpdef settle(self, Entry entry)
    cpdef dispatch(self)


@cython.locals(queue=Queue, ok=bint)
cpdef tuple enqueue(Message msg, object queues, bint confirming=*)
