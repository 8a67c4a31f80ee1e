"""targets.ort.cpu"""
