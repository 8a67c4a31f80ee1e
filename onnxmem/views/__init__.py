"""What a person or a pipeline sees, all read from one Analysis: report.py (the frozen result dataclasses and their
JSON), render.py (table, Markdown, JSON), formats.py (the format registry), html.py (the HTML page), plot.py and
series.py (pictures and what they draw), safe.py (model text made safe for a terminal and for Markdown)."""
