"""Client protocol front ends: one package per wire protocol.

Each front end is a parser (bytes -> request values), a command table
(request values -> core operations) and an encoder (protocol-neutral results
-> bytes).  Nothing here performs I/O: the shell feeds the parser and writes
what the encoder returns.
"""
