"""What the benches share: recorded results, intervals, paired engines, side-by-side profiles."""
