# The hashed uniform draw, called from compiled code without a Python call: see _draw.pyx.

cpdef double uniform_draw(object seed, object instance, object request_id) except? -1.0
