"""What-if sizing of the host pool: its recorded block accesses replayed at other sizes."""
