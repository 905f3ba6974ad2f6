"""Costs: the FLOPs and bytes of operators and compiled steps, analytic vs measured, and the
roofline classification against the device's roofs.
"""
