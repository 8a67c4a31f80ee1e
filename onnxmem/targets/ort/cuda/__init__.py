"""targets.ort.cuda"""
