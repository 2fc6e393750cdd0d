"""Measuring a machine for the simulator (`ratrain profile`): the measuring processes (ranks),
their fits into a hardware profile (measure), its table (table), and the other work sharing
the machine while it measures (other_work)."""
