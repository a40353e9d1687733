"""The simulator's HTTP front: vLLM's OpenAI surface over the engine, in real time.

flags (``vllm serve``'s flag names), protocol (request parsing, SSE bodies), tokenizer,
live (the engine stepped on the wall clock), server (aiohttp routes) and testing (a
server in a background thread for tests).
"""
