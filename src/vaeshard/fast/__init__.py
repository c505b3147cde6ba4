"""The fast tier's machinery that is not a kernel nor a leaf layer: the frame loop of causal video
decoders (frame_loop.py) and the causal convolutions that keep a cache of their input frames for it
(causal_conv.py). Families declare what they need of it (families/); it imports no family."""
