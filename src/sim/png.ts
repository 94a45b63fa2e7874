/**
 * PNG rendering of the simulator's SVG charts with resvg (`@resvg/resvg-js`, prebuilt binaries),
 * loaded on demand so the other commands never pay for it. Text uses the system's fonts.
 */

/**
 * Renders a standalone SVG document to PNG bytes at its own size, on a white background.
 * @throws the renderer's error when the SVG is malformed or the package is not installed.
 */
export async function renderPng(svg: string): Promise<Uint8Array> {
  const { Resvg } = await import('@resvg/resvg-js');
  const r = new Resvg(svg, {
    background: '#ffffff',
    font: {
      loadSystemFonts: true,
      defaultFontFamily: 'DejaVu Sans',
      sansSerifFamily: 'DejaVu Sans',
    },
  });
  return new Uint8Array(r.render().asPng());
}
