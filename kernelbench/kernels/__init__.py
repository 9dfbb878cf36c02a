"""Checked Python wrappers of the C++/CUDA extensions (``csrc/``) and the padding they need.

May import: the ground modules (``core``, ``checks``, ``quant``). Never backends or anything above.
"""
