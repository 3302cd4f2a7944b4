"""The transaction coordinator (KIP-98, KIP-447), in the timer process beside the group coordinator."""
