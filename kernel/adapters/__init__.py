"""The adapter contract: how accepted intents reach brokers, booking systems and databases,
and the execution constraints an intent must still meet when it is carried out.
"""
