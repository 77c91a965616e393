"""What the routes read: series, aggregates, timelines, tiers, certainty, clocks, incidents."""
