"""What keeps a broker process healthy and observable below everything else: logs, the
clock, stalls and the garbage collector's schedule, resource alarms, task ending. It imports
nothing of the broker at run time (tests/test_layers.py)."""
