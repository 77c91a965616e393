"""Why prompt tokens missed the tiers, and tiers written and never read, from the block events."""
