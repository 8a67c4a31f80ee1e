"""targets.ort"""
