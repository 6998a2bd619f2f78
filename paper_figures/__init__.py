"""Scripts that redraw the paper's figures from result files only."""
