"""Where the pool index comes from: a snapshot file, or the live cluster through list+watch; and the one
place that chooses between them (open.open_inventory)."""
