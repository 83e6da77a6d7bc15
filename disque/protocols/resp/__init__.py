"""RESP2/RESP3, the Disque (and Redis) client protocol: the first front end
(parser.py, commands.py and admin.py, encoder.py; `front.RESP` ties them)."""
