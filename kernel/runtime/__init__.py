"""The actor machinery: mailboxes, the Outbox that records before it sends, the supervisor,
and every message one actor sends another.
"""
