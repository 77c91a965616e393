"""What tests, bench, verify and the demo share to drive engines and stand-in peers."""
