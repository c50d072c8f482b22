# Types for compiling graph.py with Cython (setup.py; the .py runs as it is without it):
# route_key becomes a C call from the compiled channel. Exchanges stay untyped here: the
# pipeline routes through these functions with exchanges of its own (pipeline/router.py).
cpdef object route_key(object exchange, object key, object headers, object lookup)
