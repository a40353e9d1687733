"""The built-in vLLM V1 scheduling simulator (see DESIGN.md, "The simulator")."""
