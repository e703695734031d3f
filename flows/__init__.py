"""flows: the streaming product around tsi_core (event handling, dataflow, command line)."""
