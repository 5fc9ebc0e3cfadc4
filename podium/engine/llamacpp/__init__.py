"""The embedded engine: llama.cpp in-process through llama-cpp-python.

Importing any of its modules first sets how llama.cpp's threads wait (``threads``), before
llama.cpp's library (and OpenMP with it) loads.
"""

from podium.engine.llamacpp.threads import configure

configure()
