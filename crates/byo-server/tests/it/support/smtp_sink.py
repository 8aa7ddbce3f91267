#!/usr/bin/python3
"""A real SMTP server for the notices tests: Debian's aiosmtpd on 127.0.0.1:<port>.

Each message accepted is written to <spool>/<n>.eml as received. While <spool>/refuse
exists every message is refused with a temporary 451 (the server "refusing and coming
back"); a recipient at nobody@ is refused with a permanent 550. <spool>/ready appears
once it listens.
"""
import os
import sys
import time

from aiosmtpd.controller import Controller

spool, port = sys.argv[1], int(sys.argv[2])


class Handler:
    async def handle_RCPT(self, server, session, envelope, address, rcpt_options):
        if address.startswith("nobody@"):
            return "550 5.1.1 no such mailbox"
        envelope.rcpt_tos.append(address)
        return "250 OK"

    async def handle_DATA(self, server, session, envelope):
        if os.path.exists(os.path.join(spool, "refuse")):
            return "451 4.3.0 try again later"
        n = len([f for f in os.listdir(spool) if f.endswith(".eml")])
        with open(os.path.join(spool, f"{n:04}.eml"), "wb") as f:
            f.write(envelope.original_content or envelope.content)
        return "250 OK"


controller = Controller(Handler(), hostname="127.0.0.1", port=port)
controller.start()
open(os.path.join(spool, "ready"), "w").close()
while True:
    time.sleep(3600)
