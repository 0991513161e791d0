// The arena's pages: an instance's buffers live in up to four storage bindings (`page0`, declared
// by the module this is appended to, and `page1` … `page3`), each no larger than the device's
// largest binding, so no model is limited by one binding. A word address is
// `page << PAGE_SHIFT | word`: `ld` and `st` pick the page. `PAGES` is 1 while the arena has one
// page (the pipeline is then specialised to `page0` alone: no page choice at all) and 4 once it
// has more; absent pages are bound to a small stand-in buffer nothing addresses.

override PAGES: u32 = 1u;

const PAGE_SHIFT: u32 = 30u;
const PAGE_MASK: u32 = (1u << PAGE_SHIFT) - 1u;

@group(0) @binding(7) var<storage, read_write> page1: array<u32>;
@group(0) @binding(8) var<storage, read_write> page2: array<u32>;
@group(0) @binding(9) var<storage, read_write> page3: array<u32>;

fn ld(a: u32) -> u32 {
    if PAGES == 1u {
        return page0[a];
    }
    let w = a & PAGE_MASK;
    switch a >> PAGE_SHIFT {
        case 0u: {
            return page0[w];
        }
        case 1u: {
            return page1[w];
        }
        case 2u: {
            return page2[w];
        }
        default: {
            return page3[w];
        }
    }
}

fn st(a: u32, v: u32) {
    if PAGES == 1u {
        page0[a] = v;
        return;
    }
    let w = a & PAGE_MASK;
    switch a >> PAGE_SHIFT {
        case 0u: {
            page0[w] = v;
        }
        case 1u: {
            page1[w] = v;
        }
        case 2u: {
            page2[w] = v;
        }
        default: {
            page3[w] = v;
        }
    }
}
