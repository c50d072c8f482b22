# Types for compiling trie.py with Cython (setup.py; the .py runs as it is without it):
# TrieNode becomes a native class whose edges are C struct members, so the walk of a routing
# key (WildcardTrie.match, the whole cost of a topic route the cache cannot answer) follows
# them as C pointers instead of slot descriptors.
import cython


cdef class TrieNode:
    cdef public dict children
    cdef public TrieNode star
    cdef public TrieNode hash
    cdef public object ids
    cdef public object cached
    cdef public object one
    cdef public object dests

    cpdef bint is_empty(self)


cdef class WildcardTrie:
    cdef public TrieNode root
    cdef public bint skip_dollar

    @cython.locals(
        n=Py_ssize_t,
        i=Py_ssize_t,
        j=Py_ssize_t,
        stop=Py_ssize_t,
        end=Py_ssize_t,
        found=list,
        node=TrieNode,
        h=TrieNode,
        nxt=TrieNode,
        star=TrieNode,
        child=TrieNode,
        h_star=TrieNode,
        children=dict,
        h_children=dict,
        hash_from=dict,
        stack=list,
    )
    cpdef list match(self, object words)
