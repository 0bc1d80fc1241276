"""The simulated wafer-scale pipeline: hardware and model catalogue, placement, the timing model,
the pipelined executor of ``decode``'s layers on a simulated clock, and validation against
published numbers."""
