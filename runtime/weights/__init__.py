"""Model files read by byte ranges: headers parsed into entries (weightfile.py), several
reads in flight at once (readpool.py), and params=disk groups filled from the file
(diskfill.py)."""
