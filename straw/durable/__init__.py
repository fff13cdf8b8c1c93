"""The durable log: self-checking frames and the rules that make appends durable.

``framing`` is the frame format and the scan that tells a torn tail from corruption (D6)
by write groups.
"""
