"""kvscope.demo: engine launcher, quick-start run and (later) the P/D demo."""
