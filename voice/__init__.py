"""The voice loop: audio in, endpointing, ASR, the decode core, phrase chunking, TTS, audio out,
with every turn traced and held against the latency budget."""
