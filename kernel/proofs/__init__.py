"""Proof anyone can check: signed checkpoints, witnesses, evidence bundles, erasure.

The journal keeps a Merkle tree over its events (kernel.journal.tree); this package
signs its roots as C2SP checkpoints (:mod:`.signing`), publishes them (:mod:`.publish`),
checks them with public keys only (:mod:`.check`), cosigns consistent ones as a
witness (:mod:`.witness`), exports a flow with its proofs (:mod:`.bundle`) and seals
personal fields so they can be erased without breaking the chain (:mod:`.erasure`).
docs/proofs.md is the user's guide.
"""
