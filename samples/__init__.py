"""The recorded sample conversations (WAV files) and their manifest, shipped as package data so that
``wafervox run`` finds them in any install: ``voice.replay.SAMPLES`` is this folder."""
