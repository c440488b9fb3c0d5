"""A session's events: the bus with its strictly increasing ``seq``, bounded replay history and live
subscribers (``bus.py``), one typed payload per event type (``payloads.py``), and what an event
holds in memory (``size.py``), by which history and backlogs are bounded."""
