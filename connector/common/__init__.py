"""What two connectors or more use: layout names, lease ids, rank tally, tier health, stats."""
