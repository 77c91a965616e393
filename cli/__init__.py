"""kvscope.cli: the `kvscope` console command."""
