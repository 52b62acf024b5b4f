"""The REST app keeps no tables of its own: what it records belongs to the domain apps.

(WeightCollection, the one model that lived here, is the catalog's since catalog
0004 / api 0002; its table kept its name, ``api_weightcollection``.)
"""
