"""The passes over the graph, declared once as a pipeline (pipeline.py: STAGES, run by run_stages): execution orders
(orders.py, order.py, schedule.py), liveness (liveness.py: one linear sweep), the bodies of If/Loop/Scan
(loops.py), and the float16 what-if's model (half_precision.py). Every view reads the pipeline's one result."""
